// The Service Bus namespace (Entra ID only), the scoring queue and the training queue. Standard
// tier: duplicate detection, which drops episodes the change feed delivers twice, is not in Basic.

@description('Name of the namespace (6-50 letters, digits and hyphens).')
@minLength(6)
@maxLength(50)
param namespaceName string

@description('Name of the scoring queue (AGENT_LEARNING_QUEUE_NAME).')
param queueName string

@description('Name of the training queue (AGENT_LEARNING_TRAIN_QUEUE_NAME): one message per agent to train.')
param trainQueueName string

@description('Duplicate-detection window of the training queue: shorter than the training schedule\'s interval, so that a re-run of one tick sends once while the next tick may ask again for an agent whose cursor has not moved (ISO 8601 duration).')
param trainDuplicateDetectionWindow string = 'PT2M'

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object = {}

@description('Deliveries before a message is dead-lettered (AGENT_LEARNING_QUEUE_MAX_DELIVERIES).')
@minValue(1)
@maxValue(2000)
param maxDeliveryCount int = 10

@description('Message lock in seconds (AGENT_LEARNING_QUEUE_LOCK_SECONDS; Service Bus allows at most 5 minutes).')
@minValue(5)
@maxValue(300)
param lockSeconds int = 60

@description('Window in which a message id seen before is dropped as a duplicate (ISO 8601 duration).')
param duplicateDetectionWindow string = 'PT1H'

@description('How long an unscored message waits before it is dead-lettered as expired (ISO 8601 duration).')
param messageTimeToLive string = 'P14D'

@description('Principal id of the managed identity the Function app runs as.')
param functionPrincipalId string

@description('Principal id of the deploying user or pipeline (empty: no role for it).')
param userPrincipalId string = ''

@description('Type of userPrincipalId.')
@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param userPrincipalType string = 'User'

// Data Sender and Data Receiver, on the queue only: enqueue sends, score receives.
var serviceBusDataSender = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var serviceBusDataReceiver = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: namespaceName
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

resource queue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: queueName
  properties: {
    lockDuration: 'PT${lockSeconds}S'
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    defaultMessageTimeToLive: messageTimeToLive
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    requiresSession: false
    enablePartitioning: false
    enableBatchedOperations: true
    maxSizeInMegabytes: 1024
  }
}

// The timer sends one message per agent with new scores; the train trigger trains that agent.
resource trainQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: trainQueueName
  properties: {
    lockDuration: 'PT5M'
    maxDeliveryCount: 5
    deadLetteringOnMessageExpiration: true
    defaultMessageTimeToLive: 'PT1H'
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: trainDuplicateDetectionWindow
    requiresSession: false
    enablePartitioning: false
    enableBatchedOperations: true
    maxSizeInMegabytes: 1024
  }
}

resource trainSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(trainQueue.id, functionPrincipalId, serviceBusDataSender)
  scope: trainQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource trainReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(trainQueue.id, functionPrincipalId, serviceBusDataReceiver)
  scope: trainQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(queue.id, functionPrincipalId, serviceBusDataSender)
  scope: queue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(queue.id, functionPrincipalId, serviceBusDataReceiver)
  scope: queue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// The deploying user: running the app or the CLI locally against both queues (the timer's
// fan-out sends to the training queue and train_agent receives from it).
resource userSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(userPrincipalId)) {
  name: guid(queue.id, userPrincipalId, serviceBusDataSender)
  scope: queue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: userPrincipalId
    principalType: userPrincipalType
  }
}

resource userReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(userPrincipalId)) {
  name: guid(queue.id, userPrincipalId, serviceBusDataReceiver)
  scope: queue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: userPrincipalId
    principalType: userPrincipalType
  }
}

resource userTrainSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(userPrincipalId)) {
  name: guid(trainQueue.id, userPrincipalId, serviceBusDataSender)
  scope: trainQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: userPrincipalId
    principalType: userPrincipalType
  }
}

resource userTrainReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(userPrincipalId)) {
  name: guid(trainQueue.id, userPrincipalId, serviceBusDataReceiver)
  scope: trainQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: userPrincipalId
    principalType: userPrincipalType
  }
}

output namespaceName string = namespace.name
output queueName string = queue.name
output trainQueueName string = trainQueue.name
// serviceBusEndpoint is https://<name>.servicebus.windows.net:443/ (another suffix in sovereign clouds).
output fullyQualifiedNamespace string = split(replace(namespace.properties.serviceBusEndpoint, 'https://', ''), ':')[0]
