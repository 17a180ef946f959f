// The Functions host storage (AzureWebJobsStorage: locks, timer state, keys) and the blob
// container Flex Consumption deploys the app package to. Shared-key access is disabled: the host
// and the deployment reach it with the app's managed identity only.

@description('Name of the storage account (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param name string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object = {}

@description('Blob container that holds the deployment package.')
param deploymentContainerName string

@description('Principal id of the managed identity the Function app runs as.')
param functionPrincipalId string

// Storage Blob Data Owner: what the Functions host needs for its own blobs and containers.
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    // checkov:skip=CKV_AZURE_35: Flex Consumption without a virtual network reaches its host storage over the public endpoint; shared keys are disabled, so every request needs the app's Entra ID token
    // checkov:skip=CKV_AZURE_59: public network access is needed without a virtual network; anonymous blob access and shared keys are both disabled
    // checkov:skip=CKV_AZURE_206: holds only host locks, timer state and the deployment package, all recreated by azd; locally redundant storage is offered in every region
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    dnsEndpointType: 'Standard'
    minimumTlsVersion: 'TLS1_2'
    publicNetworkAccess: 'Enabled'
    supportsHttpsTrafficOnly: true
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource blobServices 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobServices
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

// The app's identity: host storage (AzureWebJobsStorage) and reading the deployment package.
resource functionBlobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, functionPrincipalId, storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwner)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output name string = storage.name
output id string = storage.id
output blobEndpoint string = storage.properties.primaryEndpoints.blob
output deploymentContainerUrl string = '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
